from specq.cli import main

main()
