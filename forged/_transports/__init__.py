"""The daemon's listeners, one shape each: ``serve_x(hub, ..., *, task_status)`` calls
``task_status.started(...)`` once it listens, then serves connections until cancelled. Each
connection is a `forged._hub.Peer` whose commands and output are the stdio protocol's."""
