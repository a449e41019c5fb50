"""The Privacy page's form: erasing a data subject, as the API's erase takes it."""

from __future__ import annotations

from django import forms

from backplane.privacy.models import SUBJECT_MAX_LENGTH
from backplane.privacy.services import REASON_MAX_LENGTH
from dashboard.forms import RefusalForm


class SubjectEraseForm(RefusalForm):
    namespace = forms.CharField(max_length=100, strip=True,
                                error_messages={"required": "say whose data subject it is: its namespace"})
    subject = forms.CharField(max_length=SUBJECT_MAX_LENGTH, strip=False,
                              error_messages={
                                  "required": "name the data subject",
                                  "max_length": f"a subject id has at most {SUBJECT_MAX_LENGTH} characters"})
    reason = forms.CharField(max_length=REASON_MAX_LENGTH, strip=True,
                             error_messages={"required": "an erasure says why (the request's ticket)",
                                             "max_length": f"a reason of at most {REASON_MAX_LENGTH:,} characters"})


class SubjectFindForm(RefusalForm):
    """A value marked ``lookup`` (as text: an e-mail, a phone number), found through the blind index."""

    namespace = forms.CharField(max_length=100, strip=True,
                                error_messages={"required": "say in which namespace to look"})
    value = forms.CharField(max_length=2000, strip=True,
                            error_messages={"required": "the value to look for, exactly as it was marked"})
