"""Generates the docs' reference pages and measurement blocks from the code and the artifacts
(`python -m docgen.pages`, `make docs-gen`)."""
