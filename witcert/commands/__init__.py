"""CLI subcommands; each module defines ``add_arguments(parser)`` and ``main(args)``."""
