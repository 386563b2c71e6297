"""The `strata` command line: `main` dispatches to one module per subcommand family."""
