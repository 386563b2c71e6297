"""The OpenAI-compatible chat server: `create_app` (in `strata.serve.app`) and `strata serve`."""
