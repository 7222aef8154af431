"""The `bertserve` command line: one entry point whose subcommands map to the pipeline stages."""
