"""The applications on top of the library: the `juice` command line (:mod:`juice.apps.cli`,
:mod:`juice.apps.analyze`), the OpenAI-compatible server (:mod:`juice.apps.server`), the console
entry point (:mod:`juice.apps.console`) and the one progress display (:mod:`juice.apps.progress`).
Nothing under `juice` outside this package imports it.
"""
