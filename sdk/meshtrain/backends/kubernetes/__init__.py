"""Kubernetes with the Kubeflow training operator: a PyTorchJob (or Trainer v2 TrainJob) plus a
ConfigMap carrying the job's /opt/ml contract, rendered from the same JobSpec as every target."""
