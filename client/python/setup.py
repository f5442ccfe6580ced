"""Builds the pagoda package with its pagoda.v1 stubs generated from the
repository's proto/ (never checked in): generate_stubs.sh runs the
distribution's protoc and grpc_python_plugin, the ones the C++ build uses."""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        subprocess.run(["sh", os.path.join(HERE, "generate_stubs.sh"), self.build_lib], check=True,
                       stdout=subprocess.DEVNULL)
        init = os.path.join(self.build_lib, "pagoda", "v1", "__init__.py")
        open(init, "a").close()


setup(cmdclass={"build_py": BuildWithStubs})
