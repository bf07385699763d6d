from dedupe_worker.chaos.cli import entry

entry()
