"""The query subcommands of ``latscope`` (report, tail, compare, ...), one module each."""
