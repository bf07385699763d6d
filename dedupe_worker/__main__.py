from dedupe_worker.cli import main

main()
