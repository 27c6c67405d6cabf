"""The ``aiayn`` command line (``main``), moved here from the top level to be split by command group."""
