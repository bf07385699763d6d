from ads_broker.cli import main

main()
