"""Build hook: a built kopt carries the workspace template (kopt.template.SHIPPED, the project's own top-level
files) in kopt/templates/, and the sdist carries those files, so `kopt init` from an installed package writes what
the source tree has. Nothing of it is committed twice; the rest of the build is in pyproject.toml. An editable
install reads the files where they are (kopt.template.root)."""

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
TEMPLATE = runpy.run_path(str(HERE / "src" / "kopt" / "template.py"))


class BuildPy(build_py):
    """build_py, then the shipped files copied into kopt/templates/ of the build (not for an editable install)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel, src in TEMPLATE["shipped"](HERE).items():
            dst = Path(self.build_lib) / "kopt" / "templates" / rel
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))


class Sdist(sdist):
    """sdist, with the shipped files in the release tree (the wheel built from it copies them in)."""

    def make_release_tree(self, base_dir, files):
        shipped = [p.relative_to(HERE).as_posix() for p in TEMPLATE["shipped"](HERE).values()]
        super().make_release_tree(base_dir, sorted(set(files) | set(shipped)))


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
