"""An event-sourced account service on chronq queues: commands in, events out, restartable after a crash."""
