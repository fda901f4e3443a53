package resp_test

import (
	"errors"
	"fmt"

	"github.com/dsslock/dsslock/sskv/internal/resp"
)

func ExampleAppendCommand() {
	args := [][]byte{[]byte("SET"), []byte("k"), []byte("v")}
	buf := make([]byte, 0, resp.CommandLen(args...))
	buf = resp.AppendCommand(buf, args...)
	fmt.Printf("%q %d\n", buf, len(buf))
	// Output: "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n" 27
}

func ExampleParseCommand() {
	payload := []byte("*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\na\r\nb\r\n")
	args, err := resp.ParseCommand(payload, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range args {
		fmt.Printf("%q\n", a)
	}

	_, err = resp.ParseCommand([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\nextra"), args)
	fmt.Println(errors.Is(err, resp.ErrSyntax), err)
	// Output:
	// "NOTIFY"
	// "SET"
	// "VALUE"
	// "a\r\nb"
	// true resp: syntax error: expected end of payload after array at offset 20
}

func ExampleParseReply() {
	for _, payload := range []string{
		"+OK\r\n",
		"$4\r\n1234\r\n",
		"$-1\r\n",
		":-1\r\n",
		"-1",                   // the public document's "not applied"
		"-ERR: not authorized", // the public document's error form
		"-ERR syntax error\r\n",
	} {
		r, err := resp.ParseReply([]byte(payload))
		if err != nil {
			fmt.Println(err)
			continue
		}
		switch r.Kind {
		case resp.KindInt:
			fmt.Println(r.Kind, r.Int)
		case resp.KindNull:
			fmt.Println(r.Kind)
		default:
			fmt.Printf("%v %q\n", r.Kind, r.Str)
		}
	}

	_, err := resp.ParseReply([]byte("$100\r\nshort\r\n"))
	fmt.Println(errors.Is(err, resp.ErrTooLarge))
	// Output:
	// simple "OK"
	// bulk "1234"
	// null
	// int -1
	// int -1
	// error "not authorized"
	// error "syntax error"
	// true
}

func ExampleAppendError() {
	b := resp.AppendError(nil, "syntax error")
	fmt.Printf("%q\n", b)
	r, _ := resp.ParseReply(b)
	fmt.Printf("%v %q\n", r.Kind, r.Str)
	// Output:
	// "-ERR syntax error\r\n"
	// error "syntax error"
}

func ExampleAppendNull() {
	var b []byte
	b = resp.AppendNull(b)
	fmt.Printf("%q\n", b)
	// Output: "$-1\r\n"
}
