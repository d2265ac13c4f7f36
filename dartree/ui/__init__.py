"""The DARTree Explorer: a Gradio app on the real engine.

- `adapter`: turns trace records (which may hold tensors) into plain lists and dicts;
- `figures`: draws Plotly figures and HTML from those plain values only (no torch);
- `app`: per-session state, the event functions (plain Python, unit-testable) and the Blocks layout.

Run it with ``python app.py`` from the repository root.
"""
