from roles.control.main import main

main()
