from equivci.cli import main

main()
