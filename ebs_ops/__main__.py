from ebs_ops.cli import main

main()
