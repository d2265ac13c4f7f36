"""DARTree Explorer: `python app.py` serves the Gradio app on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT
(default 0.0.0.0:7860). DARTREE_THREADS pins torch's CPU threads (default: 1 on machines with two cores or
fewer, where a second thread competing with other work slows the small target down several times; torch's
own default elsewhere)."""

import os
import time

import torch

from dartree.ui.layout import CSS, build_demo


def set_threads() -> int:
    """Pin torch's CPU threads as DARTREE_THREADS says (see the module's doc); returns the count in use.
    scripts/measure_explorer.py calls it too, so that its bench runs as the app does."""
    threads = int(os.environ.get("DARTREE_THREADS", "0") or 0)
    if threads <= 0 and (os.cpu_count() or 1) <= 2:
        threads = 1
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def main():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # Gradio reads it when the app starts
    set_threads()
    t0 = time.perf_counter()
    demo = build_demo()
    print(f"[dartree] explorer ready in {time.perf_counter() - t0:.1f} s", flush=True)
    demo.queue(default_concurrency_limit=1, max_size=64)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), css=CSS, show_error=False,
                footer_links=["api"])


if __name__ == "__main__":
    main()
