from offload.cli.main import main

main()
