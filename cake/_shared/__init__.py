"""Host code that several family packages share (for RMSNorm: both RMSNorm families; for
Gated DeltaNet: both GDN families, ``gdn*.py``; for the LM head: both, ``lm_head*.py``).

Vendoring copies into a vendored family the shared modules it imports (as ``_shared/``), next to
``core``; a shared module imports only ``..core``, the standard library and torch, so the same
relative imports hold in both layouts.
"""
