"""Method writers and readers over chronq queues: typing.Protocol interfaces become messages."""
