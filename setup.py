"""The C accelerator, declared here rather than in pyproject.toml: setuptools still calls
``[tool.setuptools.ext-modules]`` experimental and warns about it on every build. Everything else is in
pyproject.toml.

``logfs._speedups`` serves the append and read hot paths; it is optional: without a C compiler the build goes
on without it and logfs falls back to aiokafka's codec (same bytes, slower). See README "Dependencies, and why".
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("logfs._speedups", sources=["logfs/_speedups.c"], optional=True)])
