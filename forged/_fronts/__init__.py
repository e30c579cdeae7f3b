"""How a process meets a client: each front opens an agent (`forged._dispatch.open_agent`),
pumps commands into it and encodes what comes out, at its own edge.

- `stdio`: ``forged --mode rpc``, one session on stdin and stdout;
- `print`: ``forged -p`` and ``--mode json``, messages from the command line;
- `acp`: the Agent Client Protocol, for editors (``--mode acp``, ``connect --acp``);
- `bridge`: ``forged connect`` and ``forged status``, a client of the daemon.
"""
