"""Model loading: the target LLM and the Domino-format drafter."""
