from roles.worker.process import main

main()
