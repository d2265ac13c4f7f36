"""The DARTree Explorer: a Gradio app on the real engine.

- `adapter`: turns trace records (which may hold tensors) into plain lists, dicts and `NodeView`s;
- `figures`: draws Plotly figures and HTML from those plain values only (no torch);
- `narrate`: the words on the page, one function per trace record type, and the panels' captions;
- `session`: one visitor's controls, decoder and views, and the event functions (plain Python, no Gradio);
- `panels`: each output by name, drawn from a session, and which panels each record type changes;
- `compare`: the Race and Sweep tabs' decoding;
- `layout`: the Gradio Blocks and the glue that binds components to those names.

Run it with ``python app.py`` from the repository root.
"""
