from spark_audit.cli import main

main()
