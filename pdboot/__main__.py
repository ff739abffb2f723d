from pdboot.cli import main

main()
