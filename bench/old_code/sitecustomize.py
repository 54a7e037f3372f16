"""Run an older commit's code with this checkout's virtualenv (`./dev at DIR ...`).

The editable install maps `tv_ir.passes` and `tv_ir.frontends` to this checkout's
`passes/` and `frontends/`, so a git worktree of another commit put first on `sys.path`
would import its own `tv_ir/` but this checkout's passes and front ends. With `TV_BASE` set
to the worktree (and this directory on PYTHONPATH, which child processes inherit), all three
come from the worktree.
"""

import importlib.machinery
import importlib.util
import os
import sys

root = os.environ.get("TV_BASE")
if root:
    sys.path.insert(0, root)
    MAPPED = {"tv_ir.passes": "passes", "tv_ir.frontends": "frontends"}

    class _FromBase:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name in MAPPED:
                folder = os.path.join(root, MAPPED[name])
                return importlib.util.spec_from_file_location(
                    name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
                )
            if any(name.startswith(p + ".") for p in MAPPED):
                return importlib.machinery.PathFinder.find_spec(name, path)
            return None

    sys.meta_path.insert(0, _FromBase)
