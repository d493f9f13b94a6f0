package main

import "testing"

// Section 15 of a report replaces the one of BENCHMARKS.md, at the start
// of the report as within the file, and the rest of the file stays.
func TestSpliceSection(t *testing.T) {
	file := "# B\n\n## 14. A\na\n\n## 15. Old\nold\n\n## A burst\nb\n"
	report := "## 15. New\nnew\n"
	got, err := spliceSection([]byte(file), []byte(report), scaleSection)
	if err != nil {
		t.Fatal(err)
	}
	if want := "# B\n\n## 14. A\na\n\n## 15. New\nnew\n## A burst\nb\n"; string(got) != want {
		t.Fatalf("spliced:\n%q\nwant\n%q", got, want)
	}
	back, err := spliceSection([]byte(report+"\n## A burst\n"), []byte(file), scaleSection)
	if err != nil {
		t.Fatal(err)
	}
	if want := "## 15. Old\nold\n\n## A burst\n"; string(back) != want {
		t.Fatalf("kept:\n%q\nwant\n%q", back, want)
	}
	if _, err := spliceSection([]byte("# none\n"), []byte(report), scaleSection); err == nil {
		t.Fatal("a file with no section 15 was spliced")
	}
}
