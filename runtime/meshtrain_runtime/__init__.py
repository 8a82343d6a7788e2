"""meshtrain_runtime: the in-host runtime (bootstrap, state, transform) built on torch."""
