"""cake-train: fused GPU training kernels for sequence models, shipped as digest-named programs.

Each family is a package ``cake.cake_<op>_<mode>_train`` (it imports torch; this package does
not, so the manifest tools and ``python -m cake`` stay light). Its public names follow one
scheme: the autograd functional ``cake_<op>_<mode>``, its class ``Cake<Op><Mode>Function``, the
helpers ``cake_<op>_<mode>_train_forward`` / ``_backward`` and the query
``is_cake_<op>_<mode>_train_supported``. Import them from the family's package; this package
re-exports nothing. ``python -m cake info`` shows what is installed and how it would load.
"""

from __future__ import annotations

import ast
from pathlib import Path

__version__ = "0.1.0"


def families() -> dict[str, list[str]]:
    """Each family package next to this file and its public names (its ``__all__``), read
    from its source without importing it (so without torch)."""
    found = {}
    for init in sorted(Path(__file__).resolve().parent.glob("cake_*/__init__.py")):
        names: list[str] = []
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names = [ast.literal_eval(e) for e in node.value.elts]
        found[f"{__name__}.{init.parent.name}"] = names
    return found


__doc__ += "\nFamilies installed here, with their public names:\n\n" + "\n".join(
    f"* ``{package}``: " + ", ".join(f"``{n}``" for n in names)
    for package, names in families().items()) + "\n"
