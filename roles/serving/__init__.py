"""``zbus-serve``: a trained model behind the Open Inference Protocol (KServe v2), following a
live job's parameters."""
