from roles.control.process import main

main()
