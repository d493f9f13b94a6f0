// Command demo is a placeholder replaced by the seed burst demo.
package main

func main() {}
