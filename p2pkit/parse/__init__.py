"""Pure parsers of host files and tool output: text in, plain data out, no I/O."""
