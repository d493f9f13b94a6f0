module github.com/ginqueue/ginqueue/_example

go 1.26

replace github.com/ginqueue/ginqueue => ../
