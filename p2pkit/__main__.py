from p2pkit.cli.main import main

main()
