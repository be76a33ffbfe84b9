"""Stand-ins the unit tests share."""


class Log:
    """Collects the messages a run would print (the `message` of `logger.MetricsLogger`)."""

    def __init__(self):
        self.messages = []

    def message(self, text):
        self.messages.append(text)


def as_from_a_terminal() -> None:
    """A `preexec_fn` for a command a test stops with SIGINT: the child starts with SIGINT
    unblocked and at its default, as a shell in a terminal starts it, whatever the test
    runner's own process inherited (a background job ignores SIGINT)."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
