"""Command-line tools installed with logfs (see pyproject.toml's [project.scripts])."""
