"""DARTree Explorer: `python app.py` serves the Gradio app on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT
(default 0.0.0.0:7860). Set DARTREE_THREADS to pin torch's CPU threads."""

from dartree.ui.app import main

if __name__ == "__main__":
    main()
