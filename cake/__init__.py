"""cake-train: fused, deterministic CUDA training kernels shipped as digest-named programs.

Family packages (``cake.cake_<op>_<mode>_train``) import torch; this package itself does not,
so the manifest tools and ``python -m cake info`` stay light.
"""

__version__ = "0.1.0"
