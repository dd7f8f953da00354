"""Sub-commands of the ``agentforge`` CLI, one module per pipeline stage; :mod:`agentforge.cli` wires them.

Every module imports its heavy dependencies inside the command, so ``agentforge --help`` stays fast.
"""
