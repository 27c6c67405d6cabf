"""The ``aiayn`` command line: ``main`` builds the parser and runs a command; one module per
command group (``data``, ``train``, ``translate``, ``serve``, ``parse``, ``demo``,
``experiment``), the options they share in ``common``.

Nothing in the library imports this package. Each module imports only the standard library at
the top, so ``aiayn --help`` builds without torch; a handler imports the library when it runs.
"""
