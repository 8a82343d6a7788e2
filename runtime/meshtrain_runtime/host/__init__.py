"""The host side, free of torch: read the /opt/ml contract, provision the code, start torchrun
through the agent wrapper, wrap every rank, and end with the success or failure file."""
