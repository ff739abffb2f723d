from pdboot.entry import main

main()
