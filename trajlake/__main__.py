from trajlake.cli import main

main()
