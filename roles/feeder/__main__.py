from roles.feeder.process import main

main()
