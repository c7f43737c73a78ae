"""The top floor: the `metadist` subcommands that run whole workflows.

`train` (meta-train, then evaluate the run) and `evaluate` (`metadist eval`) may use every
layer below; `metadist.cli` dispatches to them. `python -m metadist.train`,
`metadist-train` and `python -m metadist.eval` are aliases.
"""
