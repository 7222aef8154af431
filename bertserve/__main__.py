from bertserve.cli import main

main()
