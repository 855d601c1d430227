from .demo.job import main

main()
