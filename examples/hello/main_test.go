package main

// The program README.md shows, run by go test.
func Example() {
	main()
	// Output:
	// sending to a@example.com on attempt 1
	// drained: true
}
