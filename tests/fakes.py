"""Stand-ins the unit tests share."""


class Log:
    """Collects the messages a run would print (the `message` of `logger.MetricsLogger`)."""

    def __init__(self):
        self.messages = []

    def message(self, text):
        self.messages.append(text)
