module github.com/snapfence/snapfence/clients/go

go 1.19
