namespace gpufence {}
